"""SGLang's native API: the /generate client and the fleet check."""
