from dap_server.server import main

main()
