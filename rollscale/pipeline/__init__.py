"""What a user touches: the command line, stage status, result tables and progress."""
