"""Ollama's API, a message's content an array: a 400 in Ollama's format ({"error": "..."}) naming messages[0]."""
import json

EXPECT = 400


def request():
    body = {"model": "x", "messages": [{"role": "user", "content": ["hi"]}]}
    return ("POST", "/api/chat", {"Content-Type": "application/json"}, json.dumps(body).encode())


def check(body):
    answer = json.loads(body)
    if list(answer) != ["error"] or "messages[0]" not in answer["error"]:
        return "not Ollama's error naming messages[0]: %s" % answer
    return None
