"""Model assets the project builds itself (the hub is out of reach of tests and demos)."""
