from sweep.cli.entry import run_command

run_command()
