"""What a user runs: the SDK (sdk), the nitro CLI (cli and its commands), result files (results) and
experiment tracking (tracking)."""
