"""The HTTP side: the aiohttp app, its routes and their guard (auth, errors), the
connection guard and the OpenAPI document."""
