"""The report: the pydantic models every command returns and all the prose of assumptions."""
