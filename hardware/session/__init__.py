"""The Session floor: the one Python API every surface drives, composed of its collaborators.

  session.py            the Session: lifecycle (launch, traces, close), and the API it offers
  state.py              what the collaborators share: the loaded run, the last stop, pause, on_event
  motion.py             run, step, goto, restart: the one scan over positions, and its Stops
  breakpoints.py        line, function and data breakpoints: set, verified, held at a position
  exception_filters.py  nan, inf, divergence: the exception a step raised
  inspection.py         frames, names, values, locations, provenance, expressions, edits
  instruction_cursor.py positions inside nodes on a chip whose nodes run as instruction streams
  instruction_level.py  disassembly, instruction breakpoints, interleavings (the sim chip)
  address_map.py        which value lived at a device address at a tick
"""

from hardware.session.session import (DataSpec, Direction, ExceptionDetails, FrameInfo, FunctionSpec, InstructionSpec,
                                      LaunchOptions, LineSpec, Session, SessionEvent, Stop)

__all__ = ["DataSpec", "Direction", "ExceptionDetails", "FrameInfo", "FunctionSpec", "InstructionSpec", "LaunchOptions",
           "LineSpec", "Session", "SessionEvent", "Stop"]
