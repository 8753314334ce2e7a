"""The AgentRun custom resource: its API names, its bounds, its CRD (the schema) and a request's body."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from host.core.vocab import Runtime
from host.k8s.objects.names import object_meta
from host.policy.caller import (
    MAX_LABEL_KEY_CHARS,
    MAX_LABEL_VALUE_CHARS,
    MAX_LABELS,
    MAX_REQUEST_ID_CHARS,
    MAX_TENANT_CHARS,
    CallerInfo,
)
from host.spec.manifest.model import SLUG_RE

# --- the contract (docs/kubernetes.md) -------------------------------------------------------------------
GROUP = "sandbox.agentnode.net"
VERSION = "v1alpha1"
KIND = "AgentRun"
PLURAL = "agentruns"
SINGULAR = "agentrun"
SHORT_NAME = "arun"
API_VERSION = f"{GROUP}/{VERSION}"
CRD_NAME = f"{PLURAL}.{GROUP}"

# --- bounds of an AgentRun ---------------------------------------------------------------------------------
# A local run's kwargs are bounded only by the admin socket's 16 MiB message; an AgentRun is one etcd object
# (1.5 MiB by default, spec and status together), so these caps are smaller: at 4 UTF-8 bytes a character,
# the worst case of goal + kwargsJson + resultJson + error + hint still fits.
MAX_GOAL_CHARS = 16 * 1024
MAX_KWARGS_JSON_CHARS = 128 * 1024
MAX_RESULT_JSON_CHARS = 128 * 1024
MAX_ERROR_CHARS = 1024
MAX_HINT_CHARS = 1024
MAX_AGENTRUN_NAME_CHARS = 63
"""An AgentRun's name is a label value on its pod, and label values stop at 63 characters."""
PHASES = ("Pending", "Scheduled", "Running", "Succeeded", "Failed")


def _anchored(pattern: re.Pattern[str]) -> str:
    """A Python fullmatch pattern as OpenAPI/CEL spell it (a search, so it needs both anchors)."""
    return f"^(?:{pattern.pattern})$"


# --- the AgentRun ------------------------------------------------------------------------------------------


def _string(max_length: int, pattern: str | None = None) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string", "maxLength": max_length}
    if pattern is not None:
        schema["pattern"] = pattern
    return schema


def _spec_schema() -> dict[str, Any]:
    caller_label_key = r"^[a-z0-9](?:[a-z0-9._-]{0,61}[a-z0-9])?$"
    return {
        "type": "object",
        "description": "What to run. Immutable: a changed request is a new AgentRun.",
        "required": ["slug"],
        "properties": {
            "slug": _string(64, _anchored(SLUG_RE)),
            "goal": _string(MAX_GOAL_CHARS),
            "kwargsJson": {
                **_string(MAX_KWARGS_JSON_CHARS),
                "description": "The run's keyword arguments as JSON text (an object).",
            },
            "runtime": {"type": "string", "enum": [Runtime.RUNSC.value, Runtime.RUNC.value]},
            "caller": {
                "type": "object",
                "properties": {
                    "tenant": _string(MAX_TENANT_CHARS, r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$"),
                    "requestId": _string(MAX_REQUEST_ID_CHARS, r"^[A-Za-z0-9._:/+=-]{1,128}$"),
                    "labels": {
                        "type": "object",
                        "description": (
                            f"At most {MAX_LABELS}; names are 1-{MAX_LABEL_KEY_CHARS} of a-z 0-9 . _ - "
                            f"({caller_label_key}; checked by the controller, as OpenAPI cannot constrain "
                            "map keys)."
                        ),
                        "maxProperties": MAX_LABELS,
                        "additionalProperties": _string(
                            MAX_LABEL_VALUE_CHARS, r"^[A-Za-z0-9._:/+=@-]{0,128}$"
                        ),
                    },
                },
            },
        },
        "x-kubernetes-validations": [
            {"rule": "self == oldSelf", "message": "spec is immutable: create a new AgentRun instead"}
        ],
    }


def _status_schema() -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "phase": {"type": "string", "enum": list(PHASES)},
            "runId": _string(64, r"^[0-9a-f]{1,64}$"),
            "podName": _string(253),
            "podUid": _string(36),
            "success": {"type": "boolean"},
            "resultJson": _string(MAX_RESULT_JSON_CHARS),
            "errorCode": {**_string(64, r"^[a-z][a-z0-9_]{0,63}$"), "description": "An audit reason."},
            "error": _string(MAX_ERROR_CHARS),
            "hint": _string(MAX_HINT_CHARS),
            "timedOut": {"type": "boolean"},
            "durationMs": {"type": "integer", "format": "int64", "minimum": 0},
            "auditDigest": {
                **_string(71, r"^(?:sha256:)?[0-9a-f]{64}$"),
                "description": "sha256 of the run's audit record line.",
            },
            "observedGeneration": {"type": "integer", "format": "int64", "minimum": 0},
            "modeUsed": _string(32, r"^[a-z_]{1,32}$"),
            "resultTruncated": {
                "type": "boolean",
                "description": "The result was larger than resultJson may hold, so it is not in the status.",
            },
        },
    }


def agentrun_crd() -> dict[str, Any]:
    """The AgentRun CustomResourceDefinition: bounds mirror a local run's, and the spec cannot change once
    admitted (the pod that runs it is made from it exactly once)."""
    schema = {
        "type": "object",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": _spec_schema(),
            "status": _status_schema(),
        },
        "x-kubernetes-validations": [
            {
                "rule": f"size(self.metadata.name) <= {MAX_AGENTRUN_NAME_CHARS}",
                "message": f"an AgentRun name is at most {MAX_AGENTRUN_NAME_CHARS} characters "
                "(it is a label value on its pod)",
            }
        ],
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": object_meta(CRD_NAME),
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": SINGULAR,
                "shortNames": [SHORT_NAME],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [
                        {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
                        {"name": "Error", "type": "string", "jsonPath": ".status.errorCode"},
                        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
                    ],
                    "schema": {"openAPIV3Schema": schema},
                }
            ],
        },
    }


@dataclass(frozen=True)
class RunRequest:
    """An AgentRun's spec, validated: what `SandboxHost.run` is called with (and what a client submits)."""

    slug: str
    goal: str | None = None
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    runtime: str | None = None
    caller: CallerInfo = field(default_factory=CallerInfo)


def agentrun(name: str, namespace: str, request: RunRequest) -> dict[str, Any]:
    """An AgentRun body; `kwargs` travels as compact JSON text (kwargsJson, `{}` when there are none), so no
    schema has to describe it. Unset fields are left out: the controller fills them from the cluster's
    config."""
    spec: dict[str, Any] = {"slug": request.slug}
    if request.goal is not None:
        spec["goal"] = request.goal
    spec["kwargsJson"] = json.dumps(
        dict(request.kwargs), separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )
    if request.runtime is not None:
        spec["runtime"] = str(request.runtime)
    caller = request.caller
    if not caller.empty:
        who: dict[str, Any] = {}
        if caller.tenant:
            who["tenant"] = caller.tenant
        if caller.request_id:
            who["requestId"] = caller.request_id
        if caller.labels:
            who["labels"] = dict(caller.labels)
        spec["caller"] = who
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


__all__ = [
    "API_VERSION",
    "CRD_NAME",
    "GROUP",
    "KIND",
    "MAX_AGENTRUN_NAME_CHARS",
    "MAX_ERROR_CHARS",
    "MAX_GOAL_CHARS",
    "MAX_HINT_CHARS",
    "MAX_KWARGS_JSON_CHARS",
    "MAX_RESULT_JSON_CHARS",
    "PHASES",
    "PLURAL",
    "SHORT_NAME",
    "SINGULAR",
    "VERSION",
    "RunRequest",
    "agentrun",
    "agentrun_crd",
]
