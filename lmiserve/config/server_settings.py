"""The settings of the HTTP front end (``serving.properties`` keys without ``option.``)."""

from __future__ import annotations

from typing import Literal

from pydantic import SecretStr, field_validator

from .fields import MIB, Area, EnvAlias, setting


class ServerSettings(Area):
    """The HTTP front end."""

    host: str = setting("0.0.0.0", "host", "Address the HTTP server binds to.", cli="--host")
    port: int = setting(
        8080,
        "port",
        "TCP port of the HTTP server.",
        env_aliases=("SAGEMAKER_BIND_TO_PORT",),
        cli="--port",
        ge=1,
        le=65535,
    )
    grpc_port: int = setting(
        8081,
        "grpc_port",
        "TCP port of the KServe V2 gRPC service (inference.GRPCInferenceService), on the same host; 0 turns "
        "it off. When the default port is taken the server starts without gRPC; a port you set must be free.",
        cli="--grpc-port",
        ge=0,
        le=65535,
    )
    ssl_certfile: str | None = setting(
        None,
        "ssl_certfile",
        "The server's certificate (PEM, with its chain): HTTPS on port and TLS on grpc_port, for every route "
        "/ping included. option.ssl_certfile is the same key. Empty: plain HTTP and gRPC.",
        key_aliases=("option.ssl_certfile",),
        allowed="a file path",
    )
    ssl_keyfile: str | None = setting(
        None,
        "ssl_keyfile",
        "The certificate's private key (PEM), needed with ssl_certfile. option.ssl_keyfile is the same key.",
        key_aliases=("option.ssl_keyfile",),
        allowed="a file path",
    )
    ssl_ca_certs: str | None = setting(
        None,
        "ssl_ca_certs",
        "CA certificates (PEM) that a client's certificate must chain to: mutual TLS, on HTTP and gRPC; a client "
        "without such a certificate is refused during the handshake. option.ssl_ca_certs is the same key. "
        "Empty: no client certificate is asked for.",
        key_aliases=("option.ssl_ca_certs",),
        allowed="a file path",
    )
    max_request_size: int = setting(
        64 * MIB,
        "max_request_size",
        "Largest request body accepted, in bytes; larger bodies get 413.",
        env_aliases=(EnvAlias("SAGEMAKER_MAX_PAYLOAD_IN_MB", MIB),),
        ge=1,
    )
    log_level: Literal["debug", "info", "warning", "error"] = setting(
        "info", "log_level", "Log verbosity of the server and its workers.", cli="--log-level"
    )
    drain_timeout: int = setting(
        20,
        "drain_timeout",
        "Seconds the requests in flight get to finish after SIGTERM, while new requests are refused with 503; "
        "then the models stop and the server exits with status 0. SageMaker kills a container 30 s after "
        "SIGTERM: keep the drain shorter. 0: stop at once.",
        ge=0,
        le=3600,
    )
    api_processes: int = setting(
        0,
        "api_processes",
        "HTTP API processes sharing the port (SO_REUSEPORT), so that tokenizing, detokenizing and formatting "
        "are spread over CPU cores. The first owns the models, their engines, the management API and the "
        "metrics; the others serve inference requests for engine models through the same engines and pass "
        "everything else to the first. Each response names the process that answered in X-Api-Process. "
        "0: one per 4 CPUs, at least 1 and at most 8.",
        ge=0,
        le=64,
    )
    api_keys: SecretStr | None = setting(
        None,
        "api_keys",
        "API keys, comma-separated, that inference and management requests must present as "
        "'Authorization: Bearer KEY' or 'X-Api-Key: KEY'; /ping and the health routes stay open. Set it in the "
        "environment (SERVING_API_KEYS), not in a model's serving.properties. Empty (and no api_keys_file): no "
        "keys asked for.",
        allowed="comma-separated keys",
    )
    api_keys_file: str | None = setting(
        None,
        "api_keys_file",
        "A file of API keys, one per line ('#' starts a comment), added to api_keys. Read when the server starts.",
        allowed="a file path",
    )
    tenant_header: str = setting(
        "",
        "tenant_header",
        "A request header that names the request's tenant (X-Tenant-Id, say). When a model's queue is full, or "
        "a request would miss its deadline there, a tenant holding less than its fair share of the requests in "
        "flight (the queue's limit divided by the tenants with requests in flight) is still admitted, and the "
        "tenants above their share get the 503s. Empty: with API keys configured, each key is a tenant; "
        "without them, no tenants.",
    )
    management_api: Literal["local", "on", "off"] = setting(
        "local",
        "management_api",
        "Who may use the management API (/models): local answers only clients on the loopback address "
        "(127.0.0.1, ::1) and 403 to others; on answers everyone (API keys still apply); off answers 404. "
        "In multi-model mode the default is on: SageMaker's load and unload calls come from outside the container.",
        allowed="local, on, off",
    )
    model_roots: str | None = setting(
        None,
        "model_roots",
        "Directories, comma-separated, that POST /models may load models from (after symlinks are resolved); "
        "anything else gets 403. Empty: the server's model directory and the directories below it.",
        allowed="comma-separated directories",
    )
    log_request_bodies: bool = setting(
        False,
        "log_request_bodies",
        "Log each request's method, path and first 4 KiB of its body (prompts included) at info level. "
        "Off by default: prompts and bodies are never logged otherwise.",
    )

    responses_store_size: int = setting(
        1000,
        "responses_store_size",
        "How many responses of the OpenAI Responses API (POST /v1/responses with store: true, the default) are "
        "kept in memory for GET /v1/responses/{id} and previous_response_id; storing one more forgets the "
        "oldest. They are kept by the main API process (every API process passes /v1/responses to it) and lost "
        "when the server stops. 0: none are kept.",
        ge=0,
    )
    responses_store_ttl: int = setting(
        3600,
        "responses_store_ttl",
        "Seconds a stored response of the OpenAI Responses API is kept; after that GET /v1/responses/{id} and "
        "previous_response_id answer 404. 0: kept until newer ones push it out (responses_store_size).",
        ge=0,
    )

    multi_model: bool = setting(
        False,
        "multi_model",
        "Multi-model mode (a SageMaker multi-model endpoint): serve the models under multi_model_root, each "
        "loaded on its first request (X-Amzn-SageMaker-Target-Model, /models/{name}/invoke) or by SageMaker's "
        "load call (POST /models), the least recently used unloaded when multi_model_memory_mb runs short.",
        env_aliases=("SAGEMAKER_MULTI_MODEL",),
    )
    multi_model_root: str = setting(
        "/opt/ml/models",
        "multi_model_root",
        "Multi-model mode: the directory whose subdirectories are the models, by name (a directory NAME, or "
        "NAME/model as SageMaker lays them out).",
        allowed="a directory",
    )
    multi_model_memory_mb: int = setting(
        0,
        "multi_model_memory_mb",
        "Multi-model mode: memory, in MiB, the loaded models may take together (each counts its "
        "required_memory_mb); loading one more unloads the least recently used idle models, and a model that "
        "still does not fit gets 507. 0: 80% of the machine's memory.",
        ge=0,
    )

    def api_process_count(self, cpus: int | None) -> int:
        """How many API processes run: ``api_processes``, or one per 4 of ``cpus`` (1 to 8) when 0."""
        if self.api_processes:
            return self.api_processes
        return max(1, min(8, (cpus or 1) // 4))

    @field_validator("log_level", mode="before")
    @classmethod
    def _lower(cls, v: object) -> object:
        return v.lower() if isinstance(v, str) else v
