"""What a running host reports about its runs: Prometheus metrics and OpenTelemetry spans."""
