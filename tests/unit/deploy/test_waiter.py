import pytest

from lmiserve.deploy.aws import DeployError
from lmiserve.deploy.waiter import wait_for_endpoint


class _Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds


class _SageMaker:
    def __init__(self, statuses):
        self._statuses = list(statuses)

    def describe_endpoint(self, EndpointName):  # noqa: N803 - boto3's parameter name
        status = self._statuses.pop(0) if len(self._statuses) > 1 else self._statuses[0]
        variants = [{"VariantName": "AllTraffic", "CurrentInstanceCount": 1, "DesiredInstanceCount": 2}]
        return {"EndpointName": EndpointName, "EndpointStatus": status, "ProductionVariants": variants}


def test_progress_lines_on_change_and_every_minute():
    clock, lines = _Clock(), []
    statuses = ["Creating"] * 10 + ["InService"]
    described = wait_for_endpoint(_SageMaker(statuses), "e", poll=15, log=lines.append, clock=clock, sleep=clock.sleep)
    assert described["EndpointStatus"] == "InService"
    assert lines == [
        "endpoint e: Creating, 1/2 instances (0m00s)",
        "endpoint e: Creating, 1/2 instances (1m00s)",
        "endpoint e: Creating, 1/2 instances (2m00s)",
        "endpoint e: InService, 1/2 instances (2m30s)",
    ]


def test_failed_is_returned_for_the_caller_to_judge():
    clock = _Clock()
    described = wait_for_endpoint(
        _SageMaker(["Creating", "Failed"]), "e", log=lambda _: None, clock=clock, sleep=clock.sleep
    )
    assert described["EndpointStatus"] == "Failed"


def test_gives_up_after_the_timeout():
    clock = _Clock()
    with pytest.raises(DeployError, match="still Updating after 5m00s"):
        wait_for_endpoint(
            _SageMaker(["Updating"]), "e", poll=30, timeout=300, log=lambda _: None, clock=clock, sleep=clock.sleep
        )
