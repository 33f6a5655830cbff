"""The HTTP side: the aiohttp app, its routes, middleware, connection guard and OpenAPI document."""
