"""KServe V2 (Open Inference Protocol): the transport-agnostic data plane shared by the REST
routes (``lmiserve.server.routes.kserve``) and the gRPC service ``inference.GRPCInferenceService``.

``grpc_predict_v2_pb2*.py`` are generated from ``grpc_predict_v2.proto`` by ``regenerate.sh``.
"""
