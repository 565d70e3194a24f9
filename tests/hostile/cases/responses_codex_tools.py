"""Tools of the kinds Codex sends beside its functions (a namespace of functions, web_search,
custom, local_shell, an unknown future type) with tool_choice "auto": the hosted ones are left
out and named in ignored_tools, never a 400."""
import json

EXPECT = 200


def request():
    body = {"model": "x", "max_output_tokens": 1, "store": False, "input": "hi", "tool_choice": "auto",
            "tools": [{"type": "namespace", "name": "agents", "tools": [{"type": "function", "name": "spawn"}]},
                      {"type": "web_search", "external_web_access": False}, {"type": "custom", "name": "apply_patch"},
                      {"type": "local_shell"}, {"type": "tool_of_2027"},
                      {"type": "function", "name": "exec_command", "parameters": {"type": "object"}}]}
    return ("POST", "/v1/responses", {"Content-Type": "application/json"}, json.dumps(body).encode())


def check(body):
    ignored = json.loads(body).get("ignored_tools")
    if ignored != ["namespace", "web_search", "custom", "local_shell", "tool_of_2027"]:
        return "ignored_tools: %s" % ignored
    return None
