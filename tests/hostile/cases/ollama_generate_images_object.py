"""Ollama's API, images an object: a 400 in Ollama's format ({"error": "..."}) naming images."""
import json

EXPECT = 400


def request():
    body = {"model": "x", "prompt": "hi", "images": {"a": 1}}
    return ("POST", "/api/generate", {"Content-Type": "application/json"}, json.dumps(body).encode())


def check(body):
    answer = json.loads(body)
    if list(answer) != ["error"] or "images" not in answer["error"]:
        return "not Ollama's error naming images: %s" % answer
    return None
