"""What a user touches: the command line (cli.py), its errors, interrupts and progress; and one folder per command
family: check/, init/, stages/ (DVC stages and status), query/ (rollscale sql), runtime/ (workers, Prefect server)."""
