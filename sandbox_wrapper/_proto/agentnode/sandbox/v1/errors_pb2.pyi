from google.protobuf import descriptor_pb2 as _descriptor_pb2
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from typing import ClassVar as _ClassVar

DESCRIPTOR: _descriptor.FileDescriptor

class ErrorReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ERROR_REASON_UNSPECIFIED: _ClassVar[ErrorReason]
    ERROR_REASON_TASK_ALREADY_FETCHED: _ClassVar[ErrorReason]
    ERROR_REASON_TASK_NOT_FETCHED: _ClassVar[ErrorReason]
    ERROR_REASON_RUN_FINISHED: _ClassVar[ErrorReason]
    ERROR_REASON_INVALID_REQUEST: _ClassVar[ErrorReason]
    ERROR_REASON_TOO_LARGE: _ClassVar[ErrorReason]
    ERROR_REASON_TOOL_NOT_ALLOWED: _ClassVar[ErrorReason]
    ERROR_REASON_TOOL_CALL_LIMIT: _ClassVar[ErrorReason]
    ERROR_REASON_TOOL_NOT_FOUND: _ClassVar[ErrorReason]
    ERROR_REASON_TOOL_PACK_UNTRUSTED: _ClassVar[ErrorReason]
    ERROR_REASON_TOOL_ARGUMENTS_INVALID: _ClassVar[ErrorReason]
    ERROR_REASON_LLM_NOT_GRANTED: _ClassVar[ErrorReason]
    ERROR_REASON_LLM_CALL_LIMIT: _ClassVar[ErrorReason]
    ERROR_REASON_LLM_INPUT_TOO_LARGE: _ClassVar[ErrorReason]
    ERROR_REASON_LLM_OUTPUT_TOO_LARGE: _ClassVar[ErrorReason]
    ERROR_REASON_LLM_MODEL_NOT_ALLOWED: _ClassVar[ErrorReason]
    ERROR_REASON_LLM_RATE_LIMITED: _ClassVar[ErrorReason]
    ERROR_REASON_LLM_TIMEOUT: _ClassVar[ErrorReason]
    ERROR_REASON_LLM_UNAVAILABLE: _ClassVar[ErrorReason]
    ERROR_REASON_RUN_DEADLINE: _ClassVar[ErrorReason]
    ERROR_REASON_HOST_ERROR: _ClassVar[ErrorReason]
    ERROR_REASON_TOO_MANY_REFUSALS: _ClassVar[ErrorReason]
    ERROR_REASON_LLM_TOKEN_BUDGET: _ClassVar[ErrorReason]
    ERROR_REASON_LLM_COST_BUDGET: _ClassVar[ErrorReason]
    ERROR_REASON_LLM_TOOL_NOT_ALLOWED: _ClassVar[ErrorReason]
ERROR_REASON_UNSPECIFIED: ErrorReason
ERROR_REASON_TASK_ALREADY_FETCHED: ErrorReason
ERROR_REASON_TASK_NOT_FETCHED: ErrorReason
ERROR_REASON_RUN_FINISHED: ErrorReason
ERROR_REASON_INVALID_REQUEST: ErrorReason
ERROR_REASON_TOO_LARGE: ErrorReason
ERROR_REASON_TOOL_NOT_ALLOWED: ErrorReason
ERROR_REASON_TOOL_CALL_LIMIT: ErrorReason
ERROR_REASON_TOOL_NOT_FOUND: ErrorReason
ERROR_REASON_TOOL_PACK_UNTRUSTED: ErrorReason
ERROR_REASON_TOOL_ARGUMENTS_INVALID: ErrorReason
ERROR_REASON_LLM_NOT_GRANTED: ErrorReason
ERROR_REASON_LLM_CALL_LIMIT: ErrorReason
ERROR_REASON_LLM_INPUT_TOO_LARGE: ErrorReason
ERROR_REASON_LLM_OUTPUT_TOO_LARGE: ErrorReason
ERROR_REASON_LLM_MODEL_NOT_ALLOWED: ErrorReason
ERROR_REASON_LLM_RATE_LIMITED: ErrorReason
ERROR_REASON_LLM_TIMEOUT: ErrorReason
ERROR_REASON_LLM_UNAVAILABLE: ErrorReason
ERROR_REASON_RUN_DEADLINE: ErrorReason
ERROR_REASON_HOST_ERROR: ErrorReason
ERROR_REASON_TOO_MANY_REFUSALS: ErrorReason
ERROR_REASON_LLM_TOKEN_BUDGET: ErrorReason
ERROR_REASON_LLM_COST_BUDGET: ErrorReason
ERROR_REASON_LLM_TOOL_NOT_ALLOWED: ErrorReason
GRPC_STATUS_FIELD_NUMBER: _ClassVar[int]
grpc_status: _descriptor.FieldDescriptor
