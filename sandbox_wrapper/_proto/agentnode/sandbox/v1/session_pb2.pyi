from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class AgentErrorCode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    AGENT_ERROR_CODE_UNSPECIFIED: _ClassVar[AgentErrorCode]
    AGENT_ERROR_CODE_BAD_ENTRYPOINT: _ClassVar[AgentErrorCode]
    AGENT_ERROR_CODE_IMPORT_FAILED: _ClassVar[AgentErrorCode]
    AGENT_ERROR_CODE_ENTRYPOINT_NOT_FOUND: _ClassVar[AgentErrorCode]
    AGENT_ERROR_CODE_AGENT_EXCEPTION: _ClassVar[AgentErrorCode]
    AGENT_ERROR_CODE_SYSTEM_EXIT: _ClassVar[AgentErrorCode]
    AGENT_ERROR_CODE_BASE_EXCEPTION: _ClassVar[AgentErrorCode]
    AGENT_ERROR_CODE_RESULT_NOT_SERIALIZABLE: _ClassVar[AgentErrorCode]
    AGENT_ERROR_CODE_RESULT_TOO_LARGE: _ClassVar[AgentErrorCode]
    AGENT_ERROR_CODE_AGENT_LIMIT: _ClassVar[AgentErrorCode]
AGENT_ERROR_CODE_UNSPECIFIED: AgentErrorCode
AGENT_ERROR_CODE_BAD_ENTRYPOINT: AgentErrorCode
AGENT_ERROR_CODE_IMPORT_FAILED: AgentErrorCode
AGENT_ERROR_CODE_ENTRYPOINT_NOT_FOUND: AgentErrorCode
AGENT_ERROR_CODE_AGENT_EXCEPTION: AgentErrorCode
AGENT_ERROR_CODE_SYSTEM_EXIT: AgentErrorCode
AGENT_ERROR_CODE_BASE_EXCEPTION: AgentErrorCode
AGENT_ERROR_CODE_RESULT_NOT_SERIALIZABLE: AgentErrorCode
AGENT_ERROR_CODE_RESULT_TOO_LARGE: AgentErrorCode
AGENT_ERROR_CODE_AGENT_LIMIT: AgentErrorCode

class FetchTaskRequest(_message.Message):
    __slots__ = ("protocol_version",)
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    protocol_version: int
    def __init__(self, protocol_version: _Optional[int] = ...) -> None: ...

class FetchTaskResponse(_message.Message):
    __slots__ = ("run_id", "entrypoint", "goal", "kwargs_json", "limits", "allowed_packages", "system_prompt", "llm", "max_result_bytes", "protocol_version", "any_package", "output_mark")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    ENTRYPOINT_FIELD_NUMBER: _ClassVar[int]
    GOAL_FIELD_NUMBER: _ClassVar[int]
    KWARGS_JSON_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    ALLOWED_PACKAGES_FIELD_NUMBER: _ClassVar[int]
    SYSTEM_PROMPT_FIELD_NUMBER: _ClassVar[int]
    LLM_FIELD_NUMBER: _ClassVar[int]
    MAX_RESULT_BYTES_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    ANY_PACKAGE_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_MARK_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    entrypoint: str
    goal: str
    kwargs_json: str
    limits: RunLimits
    allowed_packages: _containers.RepeatedScalarFieldContainer[str]
    system_prompt: str
    llm: LlmGrant
    max_result_bytes: int
    protocol_version: int
    any_package: bool
    output_mark: bytes
    def __init__(self, run_id: _Optional[str] = ..., entrypoint: _Optional[str] = ..., goal: _Optional[str] = ..., kwargs_json: _Optional[str] = ..., limits: _Optional[_Union[RunLimits, _Mapping]] = ..., allowed_packages: _Optional[_Iterable[str]] = ..., system_prompt: _Optional[str] = ..., llm: _Optional[_Union[LlmGrant, _Mapping]] = ..., max_result_bytes: _Optional[int] = ..., protocol_version: _Optional[int] = ..., any_package: _Optional[bool] = ..., output_mark: _Optional[bytes] = ...) -> None: ...

class RunLimits(_message.Message):
    __slots__ = ("max_tool_calls", "max_iterations", "max_runtime_seconds", "stop_on_consecutive_errors")
    MAX_TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    MAX_ITERATIONS_FIELD_NUMBER: _ClassVar[int]
    MAX_RUNTIME_SECONDS_FIELD_NUMBER: _ClassVar[int]
    STOP_ON_CONSECUTIVE_ERRORS_FIELD_NUMBER: _ClassVar[int]
    max_tool_calls: int
    max_iterations: int
    max_runtime_seconds: int
    stop_on_consecutive_errors: int
    def __init__(self, max_tool_calls: _Optional[int] = ..., max_iterations: _Optional[int] = ..., max_runtime_seconds: _Optional[int] = ..., stop_on_consecutive_errors: _Optional[int] = ...) -> None: ...

class LlmGrant(_message.Message):
    __slots__ = ("enabled", "max_calls", "max_input_chars", "max_output_chars", "max_input_tokens", "max_output_tokens", "max_total_tokens", "max_cost_usd")
    ENABLED_FIELD_NUMBER: _ClassVar[int]
    MAX_CALLS_FIELD_NUMBER: _ClassVar[int]
    MAX_INPUT_CHARS_FIELD_NUMBER: _ClassVar[int]
    MAX_OUTPUT_CHARS_FIELD_NUMBER: _ClassVar[int]
    MAX_INPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_TOTAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_COST_USD_FIELD_NUMBER: _ClassVar[int]
    enabled: bool
    max_calls: int
    max_input_chars: int
    max_output_chars: int
    max_input_tokens: int
    max_output_tokens: int
    max_total_tokens: int
    max_cost_usd: float
    def __init__(self, enabled: _Optional[bool] = ..., max_calls: _Optional[int] = ..., max_input_chars: _Optional[int] = ..., max_output_chars: _Optional[int] = ..., max_input_tokens: _Optional[int] = ..., max_output_tokens: _Optional[int] = ..., max_total_tokens: _Optional[int] = ..., max_cost_usd: _Optional[float] = ...) -> None: ...

class ReportResultRequest(_message.Message):
    __slots__ = ("value_json", "failure")
    VALUE_JSON_FIELD_NUMBER: _ClassVar[int]
    FAILURE_FIELD_NUMBER: _ClassVar[int]
    value_json: str
    failure: AgentFailure
    def __init__(self, value_json: _Optional[str] = ..., failure: _Optional[_Union[AgentFailure, _Mapping]] = ...) -> None: ...

class AgentFailure(_message.Message):
    __slots__ = ("code", "message")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    code: AgentErrorCode
    message: str
    def __init__(self, code: _Optional[_Union[AgentErrorCode, str]] = ..., message: _Optional[str] = ...) -> None: ...

class ReportResultResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
