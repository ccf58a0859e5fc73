"""gRPC plumbing shared by the services and the SDK: channels and servers (grpc_util), bearer-token
auth (auth) and Prometheus metrics (metrics). The generated stubs stay in nitro.v1, the path protoc
derives from protos/nitro/v1/."""
