"""Ollama's API, format a number: a 400 in Ollama's format ({"error": "..."}) naming format."""
import json

EXPECT = 400


def request():
    body = {"model": "x", "messages": [], "format": 7}
    return ("POST", "/api/chat", {"Content-Type": "application/json"}, json.dumps(body).encode())


def check(body):
    answer = json.loads(body)
    if list(answer) != ["error"] or "format" not in answer["error"]:
        return "not Ollama's error naming format: %s" % answer
    return None
