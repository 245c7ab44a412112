from taskfleet.cli import main

main()
