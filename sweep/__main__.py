from sweep.cli import run_command

run_command()
