"""An example handler of its own directory: each trade into a DynamoDB table."""
