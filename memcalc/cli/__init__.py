"""The command line: commands, their options and parameter types."""
