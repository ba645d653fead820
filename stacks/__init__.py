"""The CDK constructs of the fleet (one logical unit per module) and the stack that
composes them. Table and metric names come from the shared ``wsfleet`` package."""
