from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ToolFailure(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TOOL_FAILURE_UNSPECIFIED: _ClassVar[ToolFailure]
    TOOL_FAILURE_LOAD: _ClassVar[ToolFailure]
    TOOL_FAILURE_RAISED: _ClassVar[ToolFailure]
    TOOL_FAILURE_NOT_SERIALIZABLE: _ClassVar[ToolFailure]
    TOOL_FAILURE_TOO_LARGE: _ClassVar[ToolFailure]
    TOOL_FAILURE_MISSING: _ClassVar[ToolFailure]
TOOL_FAILURE_UNSPECIFIED: ToolFailure
TOOL_FAILURE_LOAD: ToolFailure
TOOL_FAILURE_RAISED: ToolFailure
TOOL_FAILURE_NOT_SERIALIZABLE: ToolFailure
TOOL_FAILURE_TOO_LARGE: ToolFailure
TOOL_FAILURE_MISSING: ToolFailure

class ToolServerHello(_message.Message):
    __slots__ = ("protocol_version",)
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    protocol_version: int
    def __init__(self, protocol_version: _Optional[int] = ...) -> None: ...

class SandboxToolCall(_message.Message):
    __slots__ = ("call_id", "entrypoint", "fallback", "arguments_json")
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    ENTRYPOINT_FIELD_NUMBER: _ClassVar[int]
    FALLBACK_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_JSON_FIELD_NUMBER: _ClassVar[int]
    call_id: int
    entrypoint: str
    fallback: str
    arguments_json: str
    def __init__(self, call_id: _Optional[int] = ..., entrypoint: _Optional[str] = ..., fallback: _Optional[str] = ..., arguments_json: _Optional[str] = ...) -> None: ...

class ToolReply(_message.Message):
    __slots__ = ("call_id", "result_json", "failure", "error_type")
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    RESULT_JSON_FIELD_NUMBER: _ClassVar[int]
    FAILURE_FIELD_NUMBER: _ClassVar[int]
    ERROR_TYPE_FIELD_NUMBER: _ClassVar[int]
    call_id: int
    result_json: str
    failure: ToolFailure
    error_type: str
    def __init__(self, call_id: _Optional[int] = ..., result_json: _Optional[str] = ..., failure: _Optional[_Union[ToolFailure, str]] = ..., error_type: _Optional[str] = ...) -> None: ...
