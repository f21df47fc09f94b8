from memcalc.cli.entry import run

run()
