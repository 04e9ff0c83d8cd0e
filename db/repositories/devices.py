"""Devices: machine kinds that kernels are timed on."""

from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from db.errors import NotFoundError
from db.models import Device


@dataclass(frozen=True)
class DeviceIn:
    name: str
    device_class: str
    arch: str
    bandwidth_gbps: float | None = None
    peak_tflops: float | None = None


def upsert_device(session: Session, record: DeviceIn) -> Device:
    """The device named ``record.name``, added if new and otherwise updated to ``record``."""
    device = session.scalar(select(Device).where(Device.name == record.name))
    if device is None:
        device = Device(name=record.name)
        session.add(device)
    device.device_class, device.arch = record.device_class, record.arch
    device.bandwidth_gbps, device.peak_tflops = record.bandwidth_gbps, record.peak_tflops
    session.flush()
    return device


def get_device(session: Session, name: str) -> Device:
    device = session.scalar(select(Device).where(Device.name == name))
    if device is None:
        raise NotFoundError(f"unknown device {name!r}; register it first")
    return device


def list_devices(session: Session) -> list[Device]:
    return list(session.scalars(select(Device).order_by(Device.id)))
