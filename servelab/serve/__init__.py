"""Serving: the FastAPI services' shared machinery (request contract, thread sharing, device),
the Flask UI's backends and web server, and the model builds and sample images they serve."""
