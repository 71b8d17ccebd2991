from testbed.cli import app

app()
