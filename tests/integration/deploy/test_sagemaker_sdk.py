"""The SageMaker Python SDK with ``lmiserve.sagemaker``: deploy -> predict -> stream -> delete.

The control plane is moto's emulation on 127.0.0.1; the runtime is a proxy on 127.0.0.1 that does
what SageMaker's front end does, in front of a real lmiserve server on a tiny model.
"""

import httpx
import pytest
import sagemaker.session
from botocore.exceptions import ClientError
from sagemaker.multidatamodel import MultiDataModel

from lmiserve.sagemaker import LmiServeModel, LmiServePredictor, serving_environment
from tests.aws.runtime_proxy import RuntimeProxy
from tests.integration.engine_server import start
from tests.tiny_models import build_model

from .conftest import IMAGE, ROLE

BUCKET = "models"
REQUEST = {"inputs": "What is Deep Learning?", "parameters": {"max_new_tokens": 8, "do_sample": False}}


@pytest.fixture(scope="module")
def container(tmp_path_factory):
    base = tmp_path_factory.mktemp("sdk")
    with start(base / "serve", build_model(base / "tiny-llama")) as server:
        yield server.wait_ready()


@pytest.fixture
def session(aws, emulator, container, monkeypatch):
    """An SDK session on the emulator, with the runtime proxy in front of the container."""
    monkeypatch.setattr(emulator, "describes_to_settle", 1)
    wait_until = sagemaker.session._wait_until
    monkeypatch.setattr(sagemaker.session, "_wait_until", lambda fn, poll=5: wait_until(fn, 0))  # no 30 s polls
    control = aws.client("sagemaker")

    def exists(endpoint: str) -> bool:
        try:
            return control.describe_endpoint(EndpointName=endpoint)["EndpointStatus"] == "InService"
        except ClientError:
            return False

    with RuntimeProxy(container.url, exists) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME", proxy.url)
        s = sagemaker.session.Session(boto_session=aws, default_bucket=BUCKET)
        s.proxy = proxy
        yield s


def direct(container, body):
    r = httpx.post(container.url + "/invocations", json=body, timeout=120)
    assert r.status_code == 200
    return r.json()


def test_serving_properties_become_the_container_environment():
    env = serving_environment(
        {"option.max_model_len": 4096, "option.enable_streaming": True, "job_queue_size": 8, "option.my_flag": "x"}
    )
    assert env == {
        "OPTION_MAX_MODEL_LEN": "4096",
        "OPTION_ENABLE_STREAMING": "true",
        "SERVING_JOB_QUEUE_SIZE": "8",
        "OPTION_MY_FLAG": "x",  # unknown option keys reach a handler, as in serving.properties
    }
    with pytest.raises(ValueError, match="did you mean 'job_queue_size'"):
        serving_environment({"job_queue_sizes": 8})


def test_deploy_predict_stream_delete(session, emulator, container):
    model = LmiServeModel(
        IMAGE,
        model_data=f"s3://{BUCKET}/lmiserve/llm/model.tar.gz",
        role=ROLE,
        serving_properties={"option.rolling_batch": "lmi", "option.max_model_len": 4096},
        env={"OPTION_TENSOR_PARALLEL_DEGREE": "max"},
        name="llm-model",
        sagemaker_session=session,
    )
    predictor = model.deploy(1, "ml.g4dn.2xlarge", endpoint_name="llm")
    assert isinstance(predictor, LmiServePredictor)

    control = session.sagemaker_client
    container_def = control.describe_model(ModelName="llm-model")["PrimaryContainer"]
    assert container_def["Image"] == IMAGE
    assert container_def["ModelDataUrl"] == f"s3://{BUCKET}/lmiserve/llm/model.tar.gz"
    assert container_def["Environment"] == {
        "OPTION_ROLLING_BATCH": "lmi",
        "OPTION_MAX_MODEL_LEN": "4096",
        "OPTION_TENSOR_PARALLEL_DEGREE": "max",
    }
    [variant] = emulator.params("SageMaker.CreateEndpointConfig")[0]["ProductionVariants"]
    assert variant["ContainerStartupHealthCheckTimeoutInSeconds"] == 1800
    assert variant["ModelDataDownloadTimeoutInSeconds"] == 1800
    assert variant["RoutingConfig"] == {"RoutingStrategy": "LEAST_OUTSTANDING_REQUESTS"}
    assert (variant["InstanceType"], variant["InitialInstanceCount"]) == ("ml.g4dn.2xlarge", 1)
    assert control.describe_endpoint(EndpointName="llm")["EndpointStatus"] == "InService"

    # predict: JSON in, JSON out, the container's own answer
    expected = direct(container, REQUEST)
    assert predictor.predict(REQUEST) == expected

    # stream: one JSON line at a time, the tokens adding up to the whole answer
    lines = list(predictor.stream(REQUEST))
    assert len(lines) == 8 and all("token" in line for line in lines)
    assert "".join(line["token"]["text"] for line in lines) == expected["generated_text"]
    assert lines[-1]["generated_text"] == expected["generated_text"]
    assert session.proxy.requests[-1]["action"] == "invocations-response-stream"

    # a bad request comes back as the runtime's ModelError, with the container's status and body
    # (LMI's documented answer to a bad parameter value: 400 and an error response)
    with pytest.raises(ClientError) as err:
        predictor.predict({"inputs": "x", "parameters": {"max_new_tokens": -1}})
    assert err.value.response["Error"]["Code"] == "ModelError"
    message = err.value.response["Error"]["Message"]
    assert "(400)" in message and '"finish_reason":"error"' in message

    # delete: the model (found through the endpoint's configuration), then the endpoint and its configuration
    predictor.delete_model()
    predictor.delete_endpoint()
    deletes = [a for a in emulator.actions("SageMaker") if a.startswith("SageMaker.Delete")]
    assert deletes == ["SageMaker.DeleteModel", "SageMaker.DeleteEndpointConfig", "SageMaker.DeleteEndpoint"]
    with pytest.raises(ClientError):
        control.describe_model(ModelName="llm-model")
    with pytest.raises(ClientError):
        control.describe_endpoint(EndpointName="llm")
    with pytest.raises(ClientError) as err:
        predictor.predict(REQUEST)
    assert err.value.response["Error"]["Code"] == "ValidationError"


def test_multi_model_endpoint_through_the_sdk(session, emulator, container):
    model = LmiServeModel(IMAGE, role=ROLE, multi_model=True, sagemaker_session=session)
    mme = MultiDataModel("llm-models", f"s3://{BUCKET}/lmiserve/models/", model=model, sagemaker_session=session)
    predictor = mme.deploy(1, "ml.c5.2xlarge", endpoint_name="llms")
    container_def = session.sagemaker_client.describe_model(ModelName="llm-models")["PrimaryContainer"]
    assert container_def["Mode"] == "MultiModel"
    assert container_def["ModelDataUrl"] == f"s3://{BUCKET}/lmiserve/models/"
    assert container_def["Environment"] == {"SAGEMAKER_MULTI_MODEL": "true"}

    # the target model travels as X-Amzn-SageMaker-Target-Model (this container's model is "tiny")
    assert predictor.predict(REQUEST, target_model="tiny") == direct(container, REQUEST)
    assert session.proxy.requests[-1]["headers"]["X-Amzn-SageMaker-Target-Model"] == "tiny"
    predictor.delete_endpoint()
