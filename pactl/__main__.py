from pactl.cli import main

main()
