"""Lambda functions of the project."""
