from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class RunToolRequest(_message.Message):
    __slots__ = ("package_slug", "tool_name", "arguments_json")
    PACKAGE_SLUG_FIELD_NUMBER: _ClassVar[int]
    TOOL_NAME_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_JSON_FIELD_NUMBER: _ClassVar[int]
    package_slug: str
    tool_name: str
    arguments_json: str
    def __init__(self, package_slug: _Optional[str] = ..., tool_name: _Optional[str] = ..., arguments_json: _Optional[str] = ...) -> None: ...

class RunToolResponse(_message.Message):
    __slots__ = ("success", "result_json", "error", "mode_used", "tool_calls_made", "tools_remaining")
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    RESULT_JSON_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    MODE_USED_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_MADE_FIELD_NUMBER: _ClassVar[int]
    TOOLS_REMAINING_FIELD_NUMBER: _ClassVar[int]
    success: bool
    result_json: str
    error: str
    mode_used: str
    tool_calls_made: int
    tools_remaining: int
    def __init__(self, success: _Optional[bool] = ..., result_json: _Optional[str] = ..., error: _Optional[str] = ..., mode_used: _Optional[str] = ..., tool_calls_made: _Optional[int] = ..., tools_remaining: _Optional[int] = ...) -> None: ...
