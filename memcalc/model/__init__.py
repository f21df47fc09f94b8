"""The user's model: where it comes from (zoo name, ``module:factory``, object), how its code
is imported, and which layout its input has."""
