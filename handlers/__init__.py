"""Task handlers: one module per task domain, each registering an ``AgentHandler``."""
