from medfaq.app.cli import main

main()
