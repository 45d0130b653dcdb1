#[distlock::locked(locks = locks, name = "report", timeout = "5s")]
async fn report(locks: &distlock::Locks) -> distlock::Result<()> {
    Ok(())
}

fn main() {}
