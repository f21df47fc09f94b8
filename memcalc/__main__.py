from memcalc.cli.commands import main

main()
