from distilkit.cli import main

main()
