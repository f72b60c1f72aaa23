"""The gRPC service schema (``grpc_service.proto``) and its generated Python module."""
