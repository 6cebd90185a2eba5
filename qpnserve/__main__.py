from qpnserve.cli import main

main()
