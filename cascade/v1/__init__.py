"""Generated from protos/cascade/v1; do not edit."""
