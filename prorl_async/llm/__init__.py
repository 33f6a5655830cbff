"""Everything that talks to the model or about it.

Engines and their pool, tokens, chat templates, tool calls and the agent loop.
"""
