from hybridctl.cli import main

main()
