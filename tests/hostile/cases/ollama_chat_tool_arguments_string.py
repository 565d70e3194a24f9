"""Ollama's API, a call's arguments as a JSON string (OpenAI's shape), where Ollama's are an object: a 400 in Ollama's format ({"error": "..."}) naming messages[1]."""
import json

EXPECT = 400


def request():
    body = {"model": "x", "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]}]}
    return ("POST", "/api/chat", {"Content-Type": "application/json"}, json.dumps(body).encode())


def check(body):
    answer = json.loads(body)
    if list(answer) != ["error"] or "messages[1]" not in answer["error"]:
        return "not Ollama's error naming messages[1]: %s" % answer
    return None
