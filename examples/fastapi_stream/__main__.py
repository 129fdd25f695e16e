"""Run the example: ``python -m examples.fastapi_stream`` (``HOST``, ``PORT`` to change where it listens)."""

import os

import uvicorn

from examples.fastapi_stream.app import create_app

uvicorn.run(create_app(), host=os.environ.get("HOST", "127.0.0.1"), port=int(os.environ.get("PORT", "8000")))
