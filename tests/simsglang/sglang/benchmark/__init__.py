"""SGLang's benchmark clients (simulated host: `serving` only)."""
