"""Every example of docs/api.md against docs/openapi.yaml (run by tests/it/api_spec.rs).

Each `## `METHOD /path`` section's examples are checked against that operation in the spec: a
curl's `-d '…'` body against its request body's schema, each ```json block (or each of its
lines, for an NDJSON answer) against its 200 answer's schema — for `application/x-ndjson`,
the line schema the media type names in `x-ndjson-line`. The `## Errors` section's examples
are `Error` objects. A block that elides part of itself with `…` outside a string is not JSON
and is counted as elided, never silently passed. Prints a summary; exits 1 on any mismatch.
"""

import json
import re
import sys

import jsonschema_rs
import yaml

spec_path, api_md_path = sys.argv[1], sys.argv[2]
spec = yaml.safe_load(open(spec_path, encoding="utf-8"))
text = open(api_md_path, encoding="utf-8").read()


def validator(schema):
    # The spec's components travel with the schema, so `#/components/...` refs resolve.
    return jsonschema_rs.Draft202012Validator({**schema, "components": spec["components"]})


def operation(method, path):
    path = path.split("?")[0]
    op = spec["paths"].get(path, {}).get(method.lower())
    if op is None:
        raise SystemExit(f"docs/api.md documents {method} {path}, which docs/openapi.yaml lacks")
    return op


def response_schema(op):
    content = op["responses"]["200"]["content"]
    if "application/json" in content:
        return content["application/json"]["schema"], False
    (media,) = content.values()
    return media["x-ndjson-line"], True


failures, checked, elided = [], 0, 0


def check(what, schema, value):
    global checked
    checked += 1
    errors = [e.message for e in validator(schema).iter_errors(value)]
    if errors:
        failures.append(f"{what}: {json.dumps(value)[:200]}\n    " + "\n    ".join(errors[:5]))


sections = re.split(r"^## ", text, flags=re.M)[1:]
for section in sections:
    title, _, body = section.partition("\n")
    m = re.fullmatch(r"`(GET|POST) (\S+)`", title.strip())
    blocks = re.findall(r"```(\w*)\n(.*?)```", body, flags=re.S)
    if m:
        method, path = m.groups()
        op = operation(method, path)
        schema, ndjson = response_schema(op)
        request = (
            op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema")
        )
    elif title.strip() == "Errors":
        method, path, schema, ndjson, request = "", "errors", {"$ref": "#/components/schemas/Error"}, False, None
    else:
        continue
    for lang, block in blocks:
        if lang == "sh":
            for data in re.findall(r"-d '([^']*)'", block):
                if request is None:
                    failures.append(f"{method} {path}: a curl sends a body the spec does not take")
                    continue
                check(f"{method} {path} request", request, json.loads(data))
            continue
        try:
            values = [json.loads(block)]
        except json.JSONDecodeError:
            try:
                values = [json.loads(line) for line in block.splitlines() if line.strip()]
            except json.JSONDecodeError:
                if "…" in block:
                    elided += 1
                    continue
                failures.append(f"{method} {path}: an example is not JSON:\n{block}")
                continue
        if len(values) > 1 and not ndjson:
            failures.append(f"{method} {path}: several JSON lines for a JSON answer")
        for v in values:
            check(f"{method} {path} answer", schema, v)

print(f"docs/api.md: {checked} examples valid against docs/openapi.yaml, {elided} elided with …")
for f in failures:
    print("MISMATCH", f)
sys.exit(1 if failures or checked == 0 else 0)
