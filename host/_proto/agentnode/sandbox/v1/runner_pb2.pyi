from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RunAdminCommandRequest(_message.Message):
    __slots__ = ("args",)
    ARGS_FIELD_NUMBER: _ClassVar[int]
    args: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, args: _Optional[_Iterable[str]] = ...) -> None: ...

class RunAdminCommandResponse(_message.Message):
    __slots__ = ("exit_code", "stdout", "stderr")
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    STDOUT_FIELD_NUMBER: _ClassVar[int]
    STDERR_FIELD_NUMBER: _ClassVar[int]
    exit_code: int
    stdout: str
    stderr: str
    def __init__(self, exit_code: _Optional[int] = ..., stdout: _Optional[str] = ..., stderr: _Optional[str] = ...) -> None: ...

class SubmitRunRequest(_message.Message):
    __slots__ = ("slug", "goal", "kwargs_json", "runtime", "caller", "limits", "files")
    SLUG_FIELD_NUMBER: _ClassVar[int]
    GOAL_FIELD_NUMBER: _ClassVar[int]
    KWARGS_JSON_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_FIELD_NUMBER: _ClassVar[int]
    CALLER_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    slug: str
    goal: str
    kwargs_json: str
    runtime: str
    caller: CallerMetadata
    limits: RunLimitOverrides
    files: RunFiles
    def __init__(self, slug: _Optional[str] = ..., goal: _Optional[str] = ..., kwargs_json: _Optional[str] = ..., runtime: _Optional[str] = ..., caller: _Optional[_Union[CallerMetadata, _Mapping]] = ..., limits: _Optional[_Union[RunLimitOverrides, _Mapping]] = ..., files: _Optional[_Union[RunFiles, _Mapping]] = ...) -> None: ...

class RunFiles(_message.Message):
    __slots__ = ("workspace", "apply", "export_tar", "export_patch", "inputs", "output_dir")
    WORKSPACE_FIELD_NUMBER: _ClassVar[int]
    APPLY_FIELD_NUMBER: _ClassVar[int]
    EXPORT_TAR_FIELD_NUMBER: _ClassVar[int]
    EXPORT_PATCH_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_DIR_FIELD_NUMBER: _ClassVar[int]
    workspace: str
    apply: bool
    export_tar: str
    export_patch: str
    inputs: _containers.RepeatedCompositeFieldContainer[RunInput]
    output_dir: str
    def __init__(self, workspace: _Optional[str] = ..., apply: _Optional[bool] = ..., export_tar: _Optional[str] = ..., export_patch: _Optional[str] = ..., inputs: _Optional[_Iterable[_Union[RunInput, _Mapping]]] = ..., output_dir: _Optional[str] = ...) -> None: ...

class RunInput(_message.Message):
    __slots__ = ("name", "path", "data")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    name: str
    path: str
    data: bytes
    def __init__(self, name: _Optional[str] = ..., path: _Optional[str] = ..., data: _Optional[bytes] = ...) -> None: ...

class RunLimitOverrides(_message.Message):
    __slots__ = ("max_runtime_seconds", "max_tool_calls", "max_iterations", "max_llm_calls", "max_total_tokens", "max_cost_usd", "egress")
    MAX_RUNTIME_SECONDS_FIELD_NUMBER: _ClassVar[int]
    MAX_TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    MAX_ITERATIONS_FIELD_NUMBER: _ClassVar[int]
    MAX_LLM_CALLS_FIELD_NUMBER: _ClassVar[int]
    MAX_TOTAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_COST_USD_FIELD_NUMBER: _ClassVar[int]
    EGRESS_FIELD_NUMBER: _ClassVar[int]
    max_runtime_seconds: int
    max_tool_calls: int
    max_iterations: int
    max_llm_calls: int
    max_total_tokens: int
    max_cost_usd: float
    egress: EgressOverride
    def __init__(self, max_runtime_seconds: _Optional[int] = ..., max_tool_calls: _Optional[int] = ..., max_iterations: _Optional[int] = ..., max_llm_calls: _Optional[int] = ..., max_total_tokens: _Optional[int] = ..., max_cost_usd: _Optional[float] = ..., egress: _Optional[_Union[EgressOverride, _Mapping]] = ...) -> None: ...

class EgressOverride(_message.Message):
    __slots__ = ("allow",)
    ALLOW_FIELD_NUMBER: _ClassVar[int]
    allow: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, allow: _Optional[_Iterable[str]] = ...) -> None: ...

class CallerMetadata(_message.Message):
    __slots__ = ("tenant", "request_id", "labels")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TENANT_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    request_id: str
    labels: _containers.ScalarMap[str, str]
    def __init__(self, tenant: _Optional[str] = ..., request_id: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ...) -> None: ...

class SubmitRunResponse(_message.Message):
    __slots__ = ("report",)
    REPORT_FIELD_NUMBER: _ClassVar[int]
    report: RunReport
    def __init__(self, report: _Optional[_Union[RunReport, _Mapping]] = ...) -> None: ...

class StreamRunRequest(_message.Message):
    __slots__ = ("slug", "goal", "kwargs_json", "runtime", "caller", "limits", "files")
    SLUG_FIELD_NUMBER: _ClassVar[int]
    GOAL_FIELD_NUMBER: _ClassVar[int]
    KWARGS_JSON_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_FIELD_NUMBER: _ClassVar[int]
    CALLER_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    slug: str
    goal: str
    kwargs_json: str
    runtime: str
    caller: CallerMetadata
    limits: RunLimitOverrides
    files: RunFiles
    def __init__(self, slug: _Optional[str] = ..., goal: _Optional[str] = ..., kwargs_json: _Optional[str] = ..., runtime: _Optional[str] = ..., caller: _Optional[_Union[CallerMetadata, _Mapping]] = ..., limits: _Optional[_Union[RunLimitOverrides, _Mapping]] = ..., files: _Optional[_Union[RunFiles, _Mapping]] = ...) -> None: ...

class StreamRunResponse(_message.Message):
    __slots__ = ("started_run_id", "stage", "report", "log")
    STARTED_RUN_ID_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    REPORT_FIELD_NUMBER: _ClassVar[int]
    LOG_FIELD_NUMBER: _ClassVar[int]
    started_run_id: str
    stage: str
    report: RunReport
    log: LogLine
    def __init__(self, started_run_id: _Optional[str] = ..., stage: _Optional[str] = ..., report: _Optional[_Union[RunReport, _Mapping]] = ..., log: _Optional[_Union[LogLine, _Mapping]] = ...) -> None: ...

class LogLine(_message.Message):
    __slots__ = ("run_id", "text")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    text: str
    def __init__(self, run_id: _Optional[str] = ..., text: _Optional[str] = ...) -> None: ...

class CancelRunRequest(_message.Message):
    __slots__ = ("run_id",)
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    def __init__(self, run_id: _Optional[str] = ...) -> None: ...

class CancelRunResponse(_message.Message):
    __slots__ = ("cancelled",)
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    cancelled: bool
    def __init__(self, cancelled: _Optional[bool] = ...) -> None: ...

class RunReport(_message.Message):
    __slots__ = ("success", "result_json", "error", "error_code", "mode_used", "run_id", "timed_out", "duration_ms", "hint", "logs", "warm", "stages_ms", "files_json")
    class StagesMsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    RESULT_JSON_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    MODE_USED_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    TIMED_OUT_FIELD_NUMBER: _ClassVar[int]
    DURATION_MS_FIELD_NUMBER: _ClassVar[int]
    HINT_FIELD_NUMBER: _ClassVar[int]
    LOGS_FIELD_NUMBER: _ClassVar[int]
    WARM_FIELD_NUMBER: _ClassVar[int]
    STAGES_MS_FIELD_NUMBER: _ClassVar[int]
    FILES_JSON_FIELD_NUMBER: _ClassVar[int]
    success: bool
    result_json: str
    error: str
    error_code: str
    mode_used: str
    run_id: str
    timed_out: bool
    duration_ms: int
    hint: str
    logs: str
    warm: bool
    stages_ms: _containers.ScalarMap[str, float]
    files_json: str
    def __init__(self, success: _Optional[bool] = ..., result_json: _Optional[str] = ..., error: _Optional[str] = ..., error_code: _Optional[str] = ..., mode_used: _Optional[str] = ..., run_id: _Optional[str] = ..., timed_out: _Optional[bool] = ..., duration_ms: _Optional[int] = ..., hint: _Optional[str] = ..., logs: _Optional[str] = ..., warm: _Optional[bool] = ..., stages_ms: _Optional[_Mapping[str, float]] = ..., files_json: _Optional[str] = ...) -> None: ...
