"""moto's AWS emulation as a real HTTP server on 127.0.0.1, with what a deployment test needs on top.

- Every API call it answers is logged (action and parameters), so a test can assert the exact calls.
- SageMaker endpoints move through their states as in AWS: ``Creating`` / ``Updating`` for a few
  DescribeEndpoint calls, then ``InService``, or ``Failed`` (an update rolls back to the previous
  configuration) when a test asks for a failure.
- ``UpdateEndpoint``, which moto does not implement, switches the endpoint to the new configuration
  and records its ``DeploymentConfig`` as ``LastDeploymentConfig``.
"""

from __future__ import annotations

import io
import json
import threading
from urllib.parse import parse_qs
from urllib.request import Request, urlopen

from moto.core.responses import ActionResult
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
from moto.sagemaker.exceptions import ValidationError
from moto.sagemaker.models import SageMakerModelBackend
from moto.sagemaker.responses import SageMakerResponse
from werkzeug.serving import make_server

TRANSITIONAL = ("Creating", "Updating")


class _QuietHandler(MotoRequestHandler):
    def log_request(self, *args: object) -> None:
        pass


class AwsEmulator:
    def __init__(self, describes_to_settle: int = 2) -> None:
        self.calls: list[tuple[str, dict]] = []
        self.describes_to_settle = describes_to_settle
        self._failures: list[str] = []
        self._progress: dict[str, int] = {}
        self._previous: dict[str, tuple[str, list]] = {}
        app = DomainDispatcherApplication(create_backend_app)
        self._server = make_server("127.0.0.1", 0, self._recording(app), threaded=True, request_handler=_QuietHandler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._patches: list[tuple[type, str, object]] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_port}"

    def start(self) -> AwsEmulator:
        self._patch(SageMakerResponse, "update_endpoint", _update_endpoint(self))
        self._patch(SageMakerModelBackend, "create_endpoint", _create_endpoint(self))
        self._patch(SageMakerModelBackend, "describe_endpoint", _describe_endpoint(self))
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        for owner, name, original in reversed(self._patches):
            if original is None:
                delattr(owner, name)
            else:
                setattr(owner, name, original)

    def reset(self) -> None:
        urlopen(Request(f"{self.url}/moto-api/reset", method="POST")).read()
        self.calls.clear()
        self._failures.clear()
        self._progress.clear()
        self._previous.clear()

    def fail_next(self, reason: str) -> None:
        """The next endpoint to settle fails (a new one ends Failed, an update rolls back)."""
        self._failures.append(reason)

    def actions(self, service: str | None = None) -> list[str]:
        return [action for action, _ in self.calls if service is None or action.startswith(service + ".")]

    def params(self, action: str) -> list[dict]:
        return [params for name, params in self.calls if name == action]

    def set_invoke_results(self, results: list[dict], region: str) -> None:
        """Queue InvokeEndpoint answers (moto's own configuration API)."""
        body = json.dumps({"region": region, "results": results}).encode()
        request = Request(f"{self.url}/moto-api/static/sagemaker/endpoint-results", data=body, method="POST")
        urlopen(request).read()

    # -- internals ---------------------------------------------------------------------------------

    def _patch(self, owner: type, name: str, replacement: object) -> None:
        self._patches.append((owner, name, owner.__dict__.get(name)))
        setattr(owner, name, replacement)

    def _recording(self, app):  # type: ignore[no-untyped-def]
        def recording_app(environ, start_response):  # type: ignore[no-untyped-def]
            target = environ.get("HTTP_X_AMZ_TARGET")
            content_type = environ.get("CONTENT_TYPE", "")
            if target or content_type.startswith("application/x-www-form-urlencoded"):
                body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
                environ["wsgi.input"] = io.BytesIO(body)
                if target:  # JSON protocols: SageMaker.CreateModel, AnyScaleFrontendService.PutScalingPolicy
                    service, _, action = target.partition(".")
                    self.calls.append((f"{service}.{action}", json.loads(body or b"{}")))
                else:  # query protocols (STS, IAM)
                    form = {k: v[0] for k, v in parse_qs(body.decode()).items()}
                    self.calls.append((f"query.{form.get('Action')}", form))
            elif not environ.get("PATH_INFO", "").startswith("/moto-api"):
                self.calls.append((f"rest.{environ['REQUEST_METHOD']} {environ.get('PATH_INFO')}", {}))
            return app(environ, start_response)

        return recording_app

    def _settle(self, endpoint) -> None:  # type: ignore[no-untyped-def]
        """Count a DescribeEndpoint; the last of ``describes_to_settle`` ends the transition."""
        if endpoint.endpoint_status not in TRANSITIONAL:
            return
        seen = self._progress.get(endpoint.endpoint_name, 0) + 1
        self._progress[endpoint.endpoint_name] = seen
        if seen < self.describes_to_settle:
            return
        self._progress.pop(endpoint.endpoint_name)
        failure = self._failures.pop(0) if self._failures else None
        if failure is None:
            endpoint.endpoint_status = "InService"
        elif endpoint.endpoint_status == "Creating":
            endpoint.endpoint_status, endpoint.failure_reason = "Failed", failure
        else:  # a failed update: the old fleet keeps serving the old configuration
            endpoint.endpoint_config_name, endpoint.production_variants = self._previous[endpoint.endpoint_name]
            endpoint.endpoint_status, endpoint.failure_reason = "InService", failure


def _create_endpoint(emulator: AwsEmulator):  # type: ignore[no-untyped-def]
    original = SageMakerModelBackend.create_endpoint

    def create_endpoint(backend, endpoint_name, endpoint_config_name, tags):  # type: ignore[no-untyped-def]
        endpoint = original(backend, endpoint_name, endpoint_config_name, tags)
        endpoint.endpoint_status = "Creating"
        return endpoint

    return create_endpoint


def _describe_endpoint(emulator: AwsEmulator):  # type: ignore[no-untyped-def]
    original = SageMakerModelBackend.describe_endpoint

    def describe_endpoint(backend, endpoint_name):  # type: ignore[no-untyped-def]
        endpoint = backend.endpoints.get(endpoint_name)
        if endpoint is not None:
            emulator._settle(endpoint)
        return original(backend, endpoint_name)

    return describe_endpoint


def _update_endpoint(emulator: AwsEmulator):  # type: ignore[no-untyped-def]
    def update_endpoint(response: SageMakerResponse) -> ActionResult:
        backend = response.sagemaker_backend
        name = response._get_param("EndpointName")
        endpoint = backend.endpoints.get(name)
        if endpoint is None:
            raise ValidationError(message=f"Could not find endpoint '{name}'.")
        if endpoint.endpoint_status != "InService":
            raise ValidationError(message=f"Cannot update in-progress endpoint '{name}'.")
        config = backend.describe_endpoint_config(response._get_param("EndpointConfigName"))
        emulator._previous[name] = (endpoint.endpoint_config_name, endpoint.production_variants)
        endpoint.endpoint_config_name = config["EndpointConfigName"]
        endpoint.production_variants = endpoint._process_production_variants(config["ProductionVariants"])
        endpoint.last_deployment_config = response._get_param("DeploymentConfig")
        endpoint.failure_reason = None
        endpoint.endpoint_status = "Updating"
        return ActionResult({"EndpointArn": endpoint.arn})

    return update_endpoint
