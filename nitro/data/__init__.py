"""The data plane: signed envelopes (codec), Redis policy store and trajectory stream (store), batch
splitting (batching), and Redis connections with credentials from the environment (redis_client)."""
