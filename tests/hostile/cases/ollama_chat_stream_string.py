"""Ollama's API, stream a string: a 400 in Ollama's format ({"error": "..."}) naming stream."""
import json

EXPECT = 400


def request():
    body = {"model": "x", "messages": [], "stream": "yes"}
    return ("POST", "/api/chat", {"Content-Type": "application/json"}, json.dumps(body).encode())


def check(body):
    answer = json.loads(body)
    if list(answer) != ["error"] or "stream" not in answer["error"]:
        return "not Ollama's error naming stream: %s" % answer
    return None
