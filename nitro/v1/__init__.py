"""Generated gRPC contracts (package nitro.v1). Regenerate with `make protos`."""
