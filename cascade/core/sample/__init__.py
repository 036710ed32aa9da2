"""What shapes and draws tokens: sampling, request processors and the grammar mask."""
