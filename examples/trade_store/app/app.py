import aws_cdk as cdk
from aws_cdk import aws_dynamodb as dynamodb
from cdk_nag import AwsSolutionsChecks

from websocket_fleet import WebSocketFleet, WorkerHandler

app = cdk.App()
stack = cdk.Stack(app, "TradeFleet")
trades = dynamodb.Table.from_table_name(stack, "Trades", app.node.try_get_context("tradeTable"))
fleet = WebSocketFleet(
    stack,
    "Fleet",
    allowed_upstream_hosts=["*.feeds.example.com"],
    handler=WorkerHandler.from_directory("../handler", factory="trade_store.sink:factory"),
    handler_environment={"TRADE_TABLE": trades.table_name},
    worker_settings={"HANDLER_ERRORS": "skip"},
)
trades.grant_write_data(fleet.task_role)
cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app))
app.synth()
