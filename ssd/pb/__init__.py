"""Generated gRPC stubs of proto/ssd/v1 (`python -m ssd.proto_gen`). Do not edit by hand."""
