from scaler_svc.server import main

main()
